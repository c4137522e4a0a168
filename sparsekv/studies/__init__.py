"""Layer 8 (research): one module per notebook (or benchmark), or a folder for a study
with parts (`equal_bytes`), the study behind it, built from the instruments
below. `findings/` holds the findings page's prose, one module per notebook, which the suite renders.
Nothing in the package imports this layer except the suite that runs the notebooks and explorers."""
