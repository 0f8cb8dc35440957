"""Micro-benchmarks of the Triton kernels in kernels/ against their torch twins.

    python -m benchmarks.kernel_bench --json OUT.json   # on a CUDA GPU (sized for an H200)
    python -m benchmarks.kernel_bench --smoke           # tiny shapes; CPU: TRITON_INTERPRET=1
    python -m benchmarks.kernel_bench --only prefill_sweep --json OUT.json  # opt-in section

The prefill_sweep section (benchmarks/sweeps/prefill_sweep.py; not in the default run) probes
every dense prefill attention variant in a child process, then checks and times the survivors on
1 x 8192 causal and the best ones on the other prefill shapes.

For every case the script first CHECKS the Triton launcher against its torch reference at that
size (max abs error and relative L2 error are printed; a failing check is reported and makes the
exit status 1), then times both with triton.testing.do_bench (median, with warmup and an L2
flush between runs). Memory-bound kernels report achieved GB/s against a measured
device-to-device copy bandwidth (a large Tensor.copy_, read + write bytes); prefill attention
reports TFLOP/s against a measured bf16 8192^3 torch.matmul rate. The torch side is the
reference twin, or F.scaled_dot_product_attention (flash, dense K/V) for full prefills.

One module per section, which driver.py runs (its `main` is importable): decode.py
(decode, decode_splits), prefill.py (prefill, prefill_8k, prefill_sweep), elementwise.py,
fp8.py (skinny_gemm, fp8); harness.py holds the case, its check, the timer and the device peaks.
Tested under the interpreter only: the GPU numbers come from whoever runs it on a GPU.
"""
