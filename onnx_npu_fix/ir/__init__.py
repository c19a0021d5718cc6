"""The model representation npufix edits: the graph index and editor, op facts (op sets, the default-domain
test, Conv geometry), QDQ helpers, subgraph splicing and load-time structural checks.
Nothing here runs onnxruntime or knows about options.
"""
