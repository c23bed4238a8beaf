"""Training a small Qwen3.5-architecture model with its MTP head, here, on Python source (issue 19).

    corpus.py   the Python files on this machine, split deterministically by file into train / held out,
                and their token stream
    mtp.py      the one-layer MTP head (fc over [norm(embed(x_t+1)), norm(h_t)], a full-attention
                decoder layer, a norm, the model's lm_head), as the builder exports it
    train.py    the resumable loop (next-token + the head's t+2 loss), bf16 weight shards of at most
                16 MB, the loss curve, and the Hugging Face checkpoint `python -m models convert` reads

    python -m models train --out DIR [--minutes 10] [--shape trained-small]
"""
