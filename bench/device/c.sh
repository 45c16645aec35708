# call C (no carry; the GGUF is still in /tmp): issue 44's LoRA pass from scratch (train.sh), then
# the W workloads and M1, each alone. A call returns at most 8 files: the fp16 adapter and the loss
# plot come back as one tar beside the six logs
source bench/device/setup.sh
TAILN=6 step train 420 bash bench/device/train.sh
python3 -m train.lora --out /tmp/run6 --export /tmp/adapter6 && cp /tmp/run6/loss.png /tmp/adapter6/ \
  && tar cf $OUT/adapter6.tar -C /tmp adapter6
for w in w3 w1 w2 m1; do TAILN=6 step $w 70 python3 -m bench --workload $w; done
TAILN=6 step w3_ngram 70 python3 -m bench --workload w3 --speculative ngram
