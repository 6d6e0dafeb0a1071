"""Where events come from: the notification socket (receiver) and the directory (discovery)."""
