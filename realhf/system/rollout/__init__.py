"""The rollout worker: the episode loop, the generation client, the OpenAI-compatible endpoint for agents."""
