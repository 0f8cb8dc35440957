# The engine's core: requests, the token-budget scheduler, the paged KV blocks and the
# prefix cache, the step-cost model. Torch-free except the KV pool.
