"""Layer 8 (research): one module per notebook (or benchmark), the study behind it, built from the instruments
below. Nothing in the package imports this layer except the suite that runs the notebooks and explorers."""
