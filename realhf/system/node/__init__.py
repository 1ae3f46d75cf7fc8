"""The node worker: nodes of the train step placed on a process of their own (ppo.graph.own_process)."""
