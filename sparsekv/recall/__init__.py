"""Layer 7 (research, beside `analysis`): recall tasks, training of recall models, end-to-end routed evaluation,
and the transformers integration.
"""
