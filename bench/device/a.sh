# call A (carry .gpu/wheels .gpu/gx0): the wheels installed once, the engine's GPU tests, G1 and
# where its host time goes
source bench/device/setup.sh
step engine_gpu 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_gpu.py tests/engine/test_alibi_gpu.py
TAILN=14 step g1_qwen 130 python3 -m bench --workload g1 --timeline
step maskprof 90 python3 -m bench.mask_profile --rows 16 64 --steps 60 --sampled --pool 0 4
step maskpos 40 python3 -m bench.mask_profile --positions
