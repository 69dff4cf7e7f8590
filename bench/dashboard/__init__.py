"""The dashboard: its pages' render time, its login limit under wrong logins, and the
screenshot of a task page with a live log."""
