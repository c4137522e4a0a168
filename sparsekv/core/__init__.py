"""Layer 1 (the runtime): what every layer shares: argument checks, the byte model (`traffic`), the backend choice,
scratch buffers and timing helpers. Imports nothing else of sparsekv (the kernels only lazily).
"""
