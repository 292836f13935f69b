"""Measuring the generator against what one would use instead: ``eagle3 bench`` (``suite``), its
peers (``peers``: Hugging Face's compiled static-cache decoding; ``llama_cpp``: llama.cpp's rows),
plain generate (``baseline``), the roofline of a round (``roofline``), where an output leaves
plain decoding (``divergence``) and the main job, ``eagle3 generate`` (``generate_job``)."""
