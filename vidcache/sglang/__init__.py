"""Everything about delivering frames to SGLang: frozen files, transports, ``prepare``, the server
configuration, ``vidcache serve`` and the plugin."""
