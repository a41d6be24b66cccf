"""The machine a plan runs on: its profile and the rates it achieves.

- :mod:`hrm.machine.hardware`: the hardware profile (docs/model.md §3.1);
- :mod:`hrm.machine.parts`: the consumer parts catalog composed into a profile (``hrm fit``);
- :mod:`hrm.machine.ggml_prior`: llama.cpp's CPU expert kernels on a catalog machine (a prior from
  this project's measured cycles per weight);
- :mod:`hrm.machine.achieved`: achieved rates with a named default for every missing value;
- :mod:`hrm.machine.launches`: an eager engine's per-operator framework overhead;
- :mod:`hrm.machine.rates`: the rates of each resource, from a profile;
- :mod:`hrm.machine.whatif`: what-if transforms of a profile (the hardware ablation).
"""
