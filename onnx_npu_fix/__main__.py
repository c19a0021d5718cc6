from onnx_npu_fix.cli import main

if __name__ == "__main__":
    main()
