# issue 44 on the GPU (c.sh runs it): 10,000 generated rows, then one LoRA pass from scratch with
# round 3's recipe (600 steps of 16, ~4.5 min on an H100)
source bench/device/setup.sh
M=$(python3 -c "from models.gguf import converted_dir; print(converted_dir('/tmp/smol.gguf'))")
python3 -m train.generate --n 10000 --seed 6 --model $M --out /tmp/round6.jsonl
python3 -m train.lora --model $M --data /tmp/round6.jsonl --out /tmp/run6 --device cuda --layers-from 0 \
  --batch-size 16 --max-len 1024 --warmup 30 --rank 8 --alpha 16 --lr 6e-4 --max-steps 600 \
  --save-every 100 --max-minutes 7
