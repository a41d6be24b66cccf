"""The model being planned: what its weights are and how tokens use them.

- :mod:`hrm.model.spec`: the model spec (docs/model.md §3.2), loaded from a ``config.json``, a GGUF or a catalog name;
- :mod:`hrm.model.hf_config`: a Hugging Face ``config.json``, per model_type and key alias, as the spec's fields;
- :mod:`hrm.model.hf_fields`: one config value read with its file and key named: the checkers and plausible ranges;
- :mod:`hrm.model.hf_llama4`: what Llama 4's text config leaves implicit (shared expert, dense width, chunked layers);
- :mod:`hrm.model.gguf`: a GGUF file's tensors and header facts, as llama.cpp will run them;
- :mod:`hrm.model.quantized`: quantized weights' bytes and their dequantizing kernels;
- :mod:`hrm.model.routing`: which experts a micro-batch touches;
- :mod:`hrm.model.options`: modelling choices that are not physics, each with a source.
"""
