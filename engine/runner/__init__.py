# The model runner: one step's tensors, the forward pass, CUDA graphs and overlapped steps.
