"""The one prepared command for a GPU node (``check.py``) and the parts it is made of."""
