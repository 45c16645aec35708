# Sourced at the start of each device call (repository root; README.md here): the wheels installed
# once into /tmp/site, the family tokenizers and the GGUF parts copied to /tmp as they arrive, and
# `step NAME SECONDS CMD...`, which logs CMD to $OUT/NAME.log under a time limit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD CHATLOOM_CACHE=/tmp/clcache
mkdir -p $CHATLOOM_CACHE
if [ -d .gpu/wheels ] && [ ! -f /tmp/site/.ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl && touch /tmp/site/.ok
fi
if [ -f .gpu/fam.tar.xz ] && [ ! -d /tmp/fam ]; then
  mkdir -p /tmp/fam && tar xJf .gpu/fam.tar.xz -C /tmp/fam && mkdir -p $CHATLOOM_CACHE/families && cp -r /tmp/fam/*-v2 $CHATLOOM_CACHE/families/
fi
for p in gx0 gx1; do [ -f .gpu/$p ] && cp .gpu/$p /tmp/$p; done
if [ ! -f /tmp/smol.gguf ] && [ -f /tmp/gx0 ] && [ -f /tmp/gx1 ]; then
  cat /tmp/gx0 /tmp/gx1 | xz -dc > /tmp/smol.gguf
fi
export CHATLOOM_GGUF=/tmp/smol.gguf
echo "setup: site $(ls /tmp/site | wc -l) entries, fam $(ls /tmp/fam 2>/dev/null | wc -l), gguf $(ls -la /tmp/smol.gguf 2>/dev/null | awk '{print $5}')"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; nproc; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
step() {  # step NAME TIMEOUT CMD...: output to $OUT/NAME.log, the tail here
  local n=$1 t=$2; shift 2
  local s=$(date +%s)
  timeout -k 5 $t "$@" > $OUT/$n.log 2>&1; local rc=$?
  echo "=== $n rc=$rc $(( $(date +%s) - s ))s"; tail -n ${TAILN:-12} $OUT/$n.log | cut -c1-400
}
