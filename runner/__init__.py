"""Running a scheduled batch on the device: the step's inputs and the paged KV pool
(model_runner), CUDA graphs of decode and mixed steps, the compiled CPU decode step, sampling with
grammar masks, and the per-sequence state the steps read (sequence, sampling_params, batch).
Imports kernels and models; engine/ sits above it and decides what runs."""
