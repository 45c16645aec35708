"""The models the engine runs: the Llama-family and ALiBi architectures in torch over chatloom's
kernels, their attention entry points, and the loaders (Hugging Face folders, GGUF files, LoRA
adapters, the tiny random checkpoints of the tests). Imports kernels only."""
