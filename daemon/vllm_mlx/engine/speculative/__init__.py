"""Speculative decoding inside the continuous batch (docs/speculative.md).

Greedy rows that opt in get tokens proposed by prompt lookup (ngram.py); one forward
pass of the target model checks every row's proposal at once (verify.py), with the
attention of each checked position computed as a decode step would (attention.py), so
the accepted tokens are the tokens decoding without speculation gives. Rows accept
different numbers of tokens; rewind.py drops the rejected positions from each row of
the batch cache. plan.py decides whether a pass is expected to pay at all.
"""
