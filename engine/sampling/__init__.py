# From logits to tokens: the batched sampler, per-request logit adjustments, logprobs and
# grammar masks.
