# call B (carry .gpu/gx1): the kernels' GPU tests and the W workloads
source bench/device/setup.sh
step kernels_gpu 200 python3 -m pytest -q -p no:cacheprovider tests/kernels -k "gpu or cuda" -m "not heavy"
for w in w3 w1 w2 m1; do TAILN=6 step $w 75 python3 -m bench --workload $w; done
