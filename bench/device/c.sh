# call C (no carry; the GGUF is still in /tmp): issue 44's LoRA pass from scratch (train.sh), its
# fp16 adapter and loss plot back under $OUT, then the W workloads and M1, each alone
source bench/device/setup.sh
TAILN=6 step train 420 bash bench/device/train.sh
python3 -m train.lora --out /tmp/run6 --export $OUT/adapter6 && cp /tmp/run6/loss.png $OUT/
for w in w3 w1 w2 m1; do TAILN=6 step $w 70 python3 -m bench --workload $w; done
TAILN=6 step w3_ngram 70 python3 -m bench --workload w3 --speculative ngram
