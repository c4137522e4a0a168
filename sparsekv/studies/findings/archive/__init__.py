"""The findings of the archived notebooks (notebooks/archive/: 09, 14, 15, 17, 19, 20, 21 and 23, superseded by
notebook 24): one module each, as for the current notebooks. Their full-run metrics stay committed, so the page still
renders them beside 24's; `..catalog` places each where the page has always had it.
"""
