"""The runner's own fetches of model-chosen URLs, and the `web` toolset built on them (toolset.py).

egress.py is the policy every such fetch obeys (checked on the address actually connected to),
egress_proxy.py puts it in front of the browser's Chromium, fetch.py is the bounded HTTP GET the
web, vision and image_gen tools share; search.py (search providers), content.py and pdf.py
(a fetched page as text) serve web_search and web_extract.
"""
