"""The master worker: the train-step loop, its data-parallel split, and what it reports when stalled."""
