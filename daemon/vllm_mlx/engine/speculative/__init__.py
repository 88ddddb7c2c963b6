"""Speculative decoding inside the continuous batch (docs/speculative.md).

Rows that opt in (greedy or sampled, with or without a grammar) get tokens proposed by
prompt lookup (ngram.py; a request's prediction indexed before its sequence) or by a
draft model batched over its rows (draft.py); one forward pass of the target model
checks every row's proposal at once (verify.py), with the attention of each checked
position computed as a decode step would (attention.py), so the logits are decoding's.
At each position a row draws the token decoding would have drawn there (draws.py: its
processors, its sampler, its own random stream) and accepts its proposal while the
draws agree: greedy output is decoding's token for token, sampled output follows the
same distribution exactly. Rows accept different numbers of tokens; rewind.py drops
the rejected positions from each row of the batch cache, emit.py hands the scheduler
one response per emitted token, plan.py decides whether a pass is expected to pay at
all, and setup.py builds the speculator and puts each request's row under it.
"""
