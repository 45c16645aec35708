# call B (carry .gpu/gx1 .gpu/fam.tar.xz): SmolLM2's GGUF is whole now. The timed runs alone (S1, G1
# on the SentencePiece and tekken vocabularies), then the real model against HF and its tool-call
# grammar on CUDA
source bench/device/setup.sh
TAILN=25 step s1 150 python3 -m bench --workload s1 --device cuda --model /tmp/smol.gguf
for f in mistral_tekken mistral_v3; do TAILN=8 step g1_$f 75 python3 -m bench --workload g1 --tokenizer /tmp/fam/ck/$f; done
step real_model 230 python3 -m pytest -q -p no:cacheprovider -m gpu -rA tests/engine/test_gpu_real_model.py tests/train/test_gpu_tool_eval.py
