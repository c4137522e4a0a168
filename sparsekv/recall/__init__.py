"""Layer 5: recall tasks, training of recall models, end-to-end routed evaluation, and the transformers
integration.
"""
