"""Analyses over estimates and real runs.

- :mod:`hrm.analysis.explain`: what each mechanism of an engine costs (``--explain``);
- :mod:`hrm.analysis.calibrate`: a profile calibrated to the user's own runs (``hrm calibrate``): the fit;
- :mod:`hrm.analysis.calibration_runs`: the runs file ``hrm calibrate`` reads, validated;
- :mod:`hrm.analysis.calibration_fields`: the profile fields a calibration fits, their ranges and parameters;
- :mod:`hrm.analysis.validation`: committed real runs against the model's predictions;
- :mod:`hrm.analysis.fit`: the fastest llama.cpp command for a machine (``hrm fit``);
- :mod:`hrm.analysis.fit_load`: the llama-server command that serves a load of requests best (``hrm fit --rate-per-s``);
- :mod:`hrm.analysis.fit_ollama`: that command's ollama form (Modelfile), or the best ollama can express;
- :mod:`hrm.analysis.fit_server`: the best command of a serving engine's export target for the same fit;
- :mod:`hrm.analysis.fit_vllm`: vLLM's answer (``--cpu-offload-gb``), or why vLLM cannot run the model;
- :mod:`hrm.analysis.fit_sglang`: SGLang + kTransformers' answer (``--kt-*``), or why SGLang cannot run it;
- :mod:`hrm.analysis.public_reports`: public llama.cpp speed reports beside HRM's predictions (docs/validation/fit_reports.md).
"""
