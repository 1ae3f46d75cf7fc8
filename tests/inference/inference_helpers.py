"""Helpers of the inference tests: an HF reference model and a tiny SGLang-protocol client."""

import json
import urllib.error
import urllib.request

import torch

# Long enough that a pause can catch requests mid-answer; the slot cache stays small (2 layers).
CONTEXT = 2048
SLOTS = 96


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
        out = self.model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()


def http(method, url, body=None, timeout=60.0):
    """(status, parsed JSON or text) — never raises on 4xx/5xx."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode()
    try:
        return status, json.loads(text) if text else None
    except json.JSONDecodeError:
        return status, text


def generate(url, input_ids, timeout=60.0, rid=None, **sampling):
    body = {"input_ids": list(input_ids), "sampling_params": sampling, "return_logprob": True}
    if rid:
        body["rid"] = rid
    status, out = http("POST", f"{url}/generate", body, timeout)
    assert status == 200, f"/generate failed with {status}: {out}"
    return out


def wait_running(url, n, timeout=30.0):
    """Until the server reports >= n running requests (SGLang's `sglang:num_running_reqs` gauge)."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    while True:
        status, text = http("GET", f"{url}/metrics")
        running = 0
        if status == 200:
            for fam in text_string_to_metric_families(text):
                if fam.name == "sglang:num_running_reqs":
                    running = sum(s.value for s in fam.samples)
        if running >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: {running} running requests after {timeout:.0f}s, waited for {n}")
        time.sleep(0.02)
