#!/usr/bin/env bash
# issue 38 item 3 on this CPU: the demo model, prefix caching on/off under shared prefixes, then speculation none/ngram under the eval set's prompts
cd /work/main
export LLM_RELEASE_HOME=/work/levers-cpu/home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
C=(--model-dir /work/smollm2 --seqs 8 --levels 2,4,8 --requests 16 --max-model-len 2048 --strategies exhaustive)
.venv/bin/python bench/tune_goodput.py "${C[@]}" --prefix-caching on,off --shared-prefix 1024:0.9:4 --prompt-tokens 256 --output-tokens 64 --output /work/levers-cpu/prefix.json > /work/levers-cpu/prefix.log 2>&1
echo "prefix rc $?" >> /work/levers-cpu/rc
.venv/bin/python bench/tune_goodput.py "${C[@]}" --skip-warmup --speculation none,ngram:3:4 --prompts-from manufacturing_kb --output-tokens 64 --output /work/levers-cpu/speculation.json > /work/levers-cpu/speculation.log 2>&1
echo "speculation rc $?" >> /work/levers-cpu/rc
