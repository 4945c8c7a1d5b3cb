"""Files in and out: output paths checked before the work, atomic writes, the user cache, sha256
checksums, and the one way a wheel is fetched from PyPI (models and corpora that run offline)."""
