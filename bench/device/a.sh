# call A (carry .gpu/wheels .gpu/gx0): the wheels installed once; the kernels' and the engine's GPU
# tests side by side (neither is timed, and the machine has 16 cores for Triton's compiles)
source bench/device/setup.sh
step kernels_gpu 420 python3 -m pytest -q -p no:cacheprovider --durations=8 tests/kernels -k "gpu or cuda" -m "not heavy" &
step engine_gpu 420 python3 -m pytest -q -p no:cacheprovider --durations=8 -m gpu tests/engine/test_gpu.py tests/engine/test_alibi_gpu.py &
wait
