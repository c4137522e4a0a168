"""Packages are found, not listed: every `sparsekv.*` subpackage, and kernels/ installed as `sparsekv.kernels`
(kernels/ sits at the top of the repository, beside the notebooks, but ships inside the package: a top-level
`kernels` would shadow another PyPI package of that name). Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

kernels = ["sparsekv.kernels" + ("." + p if p else "") for p in [""] + find_packages("kernels")]
setup(packages=find_packages(include=["sparsekv", "sparsekv.*"]) + kernels,
      package_dir={"sparsekv": "sparsekv", "sparsekv.kernels": "kernels"})
