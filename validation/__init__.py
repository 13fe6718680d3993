"""Validation: Gaussian mean/covariance ODEs, the token system, distances and reports.

Filled by the validation work (see docs/architecture.md); nothing is exported yet.
"""
