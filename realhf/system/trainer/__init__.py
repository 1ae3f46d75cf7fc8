"""The trainer (model worker): its request loop and the stream dataset trajectories arrive in."""
