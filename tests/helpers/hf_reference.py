"""The HF model's own forward: what every token and log-prob the native engine returns is checked against."""

import torch


class HFReference:
    """The HF model's own full forward: what every returned token and log-prob is checked against."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(self, prompt, output, temperature):
        """log_softmax(logits / T) of the full forward at each output token (T=0: T treated as 1)."""
        ids = torch.tensor([list(prompt) + list(output)])
        logits = self.model(ids).logits[0, len(prompt) - 1 : -1].float()
        t = temperature if temperature > 0 else 1.0
        return torch.log_softmax(logits / t, dim=-1).gather(1, torch.tensor(output)[:, None]).squeeze(1)

    @torch.no_grad()
    def greedy(self, prompt, n):
        out = self.model.generate(
            torch.tensor([list(prompt)]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        return out[0, len(prompt) :].tolist()
