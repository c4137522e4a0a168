"""Layer 9 (research, the top): the notebook suite: the papermill runner, metrics and checks, regression against baselines,
the findings page, and shared figure pieces.
"""
