"""NumPy twins of the WGSL and C kernels (CPython only), which the tests compare the kernels against."""
