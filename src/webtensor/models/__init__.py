"""Models built on webtensor's ops."""
