"""What live logs cost Redis and the host daemon, and what they cost tasks that print nothing."""
