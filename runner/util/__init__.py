"""What the whole project shares, engine and kinds alike: text words (text.py), hashing, atomic files, the crash
points (faults.py), this interpreter, retries and the process tags (sweep.py). Each module imports nothing of
the project but another of these (tests/test_layers.py holds it), so steps/ may import them."""
