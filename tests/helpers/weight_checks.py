"""What a generation server serves, checked against HF: perturbed copies of a model (new weight
versions a trainer would publish), their greedy answer, and a server's version and answer."""

import torch
from transformers import AutoModelForCausalLM

from helpers.http import http
from helpers.sglang_client import generate

PROMPT = [7, 8, 9, 10]


def perturbed(model_path, seed):
    model = AutoModelForCausalLM.from_pretrained(model_path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def hf_greedy(model, n=8):
    with torch.no_grad():
        logits_ids = []
        ids = torch.tensor([PROMPT])
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax()
            logits_ids.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return logits_ids


def served_version(url):
    status, info = http("GET", f"{url}/get_model_info")
    assert status == 200, info
    return int(info["weight_version"])


def served(url):
    """(weight version, greedy answer to PROMPT) of the server at `url`."""
    version = served_version(url)
    out = generate(url, PROMPT, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    return version, out["output_ids"]
