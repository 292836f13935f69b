"""EAGLE-3 speculative decoding as a Hugging Face custom generation method.

transformers runs this file's ``generate(model, ...)`` for
``model.generate(..., custom_generate=FOLDER, trust_remote_code=True, draft_model=DRAFT)``.
The method lives in the eagle3_ext package (``pip install eagle3_ext``); this file forwards to
it, so a copy of this folder in a model repository runs the installed library's code.
"""

from eagle3_ext.api.custom_generate import generate  # noqa: F401  (what transformers calls)
