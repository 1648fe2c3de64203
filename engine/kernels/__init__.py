"""CPU kernels (C, built by the install into _cpu_kernels*.so) and the Triton kernels."""
