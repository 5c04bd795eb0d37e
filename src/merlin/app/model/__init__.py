"""The app's Qt-free model: the chat store, prompt options, text rendering to HTML, stats."""
