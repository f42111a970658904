"""Files that ship with fastgen: the digits teacher (``digits_teacher.pth``, see
``Digits/config_dmd2_digits``) and the digits classifier used by ``fastgen eval`` (``digits_classifier.pt``)."""
