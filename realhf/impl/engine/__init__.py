"""Trainer engines: implementations of realhf.api.engine_api.TrainEngine."""
