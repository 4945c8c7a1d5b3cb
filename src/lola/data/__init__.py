"""Text for training and evaluation: registered corpora that run offline, loading, the held-out split, token chunks."""
