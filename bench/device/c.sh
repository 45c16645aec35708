# call C (carry .gpu/gx2 .gpu/fam.tar.xz): SmolLM2's GGUF is whole now: the real model against HF,
# its tool-call evaluation on CUDA, S1; G1 on two more vocabularies
source bench/device/setup.sh
TAILN=25 step s1 150 python3 -m bench --workload s1 --device cuda --model /tmp/smol.gguf
step real_model 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_gpu_real_model.py tests/train/test_gpu_tool_eval.py
for f in mistral_tekken mistral_v3; do TAILN=8 step g1_$f 75 python3 -m bench --workload g1 --tokenizer /tmp/fam/ck/$f; done
