"""The laboratory: benchmark workloads, kernel micro-benchmarks, timelines and the `--set` switches.

It imports the product (engine, kernels, grammar); nothing shipped imports it. Measured numbers live in
docs/performance.md, each with the command and machine that produced it.

    python -m bench --workload c1 --peer hf     # same as `chatloom bench ...` (bench.workloads)
    python -m bench.kernels --tiny              # every Triton kernel against its torch reference
    python -m bench.host_step --batch 32        # the engine step's host time, device work stubbed
    python -m bench.w2_attention --tiny         # decode attention at W2's recorded steps
    python -m bench.qkv_configs --tiny          # kernels.qkv_new_token's configurations
    python -m bench.tail_timeline               # where the one-launch decode layer tail spends its time
"""
