"""Files in and out: output paths checked before the work, atomic writes, the user cache, sha256 checksums."""
