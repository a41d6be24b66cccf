"""Analyses over estimates and real runs.

- :mod:`hrm.analysis.explain`: what each mechanism of an engine costs (``--explain``);
- :mod:`hrm.analysis.calibrate`: a profile calibrated to the user's own runs (``hrm calibrate``);
- :mod:`hrm.analysis.validation`: committed real runs against the model's predictions;
- :mod:`hrm.analysis.fit`: the fastest llama.cpp command for a machine (``hrm fit``).
"""
