// run_model.cpp -- runs an AOTInductor package (torch._inductor.aoti_compile_and_package) of a
// model that calls pcops ops, from C++ without Python.
//
// pcops's op library is the extension module pcops/_C.abi3.so; loading it registers
// torch.ops.pcops.* with the dispatcher (its static initialisers), which is all the package's
// calls of those ops need. It refers to Python only through functions that run in Python, so
// dlopen with RTLD_LAZY loads it into a program without Python.
//
//   run_model <pcops library> <package.pt2> <cpu|cuda> <input dir> <output dir>
//
// The input dir holds inputs.txt, one line per model input: "<file> <dtype> <d0> <d1> ...",
// with the tensor's bytes in <file> (contiguous, native byte order); dtype is one of float32,
// float64, int64, int32, bool. The outputs are written the same way (outputs.txt, out_<i>.bin)
// and summarised on stdout; examples/aoti/export.py writes the inputs and compares the outputs
// with eager PyTorch.
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Dtype {
    const char* name;
    at::ScalarType type;
};

const Dtype kDtypes[] = {{"float32", at::kFloat}, {"float64", at::kDouble}, {"int64", at::kLong},
                         {"int32", at::kInt},     {"bool", at::kBool}};

at::ScalarType dtype_from_name(const std::string& name) {
    for (const Dtype& d : kDtypes)
        if (name == d.name) return d.type;
    throw std::runtime_error("unknown dtype " + name);
}

const char* dtype_name(at::ScalarType type) {
    for (const Dtype& d : kDtypes)
        if (type == d.type) return d.name;
    throw std::runtime_error(std::string("no file format for dtype ") + c10::toString(type));
}

std::vector<at::Tensor> read_tensors(const std::string& dir) {
    std::ifstream list(dir + "/inputs.txt");
    if (!list) throw std::runtime_error("cannot read " + dir + "/inputs.txt");
    std::vector<at::Tensor> tensors;
    std::string line;
    while (std::getline(list, line)) {
        std::istringstream fields(line);
        std::string file, dtype;
        if (!(fields >> file >> dtype)) continue;
        std::vector<int64_t> sizes;
        for (int64_t s; fields >> s;) sizes.push_back(s);
        at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype_from_name(dtype)));
        std::ifstream data(dir + "/" + file, std::ios::binary);
        data.read(static_cast<char*>(t.data_ptr()), (std::streamsize)t.nbytes());
        if (!data) throw std::runtime_error("cannot read " + dir + "/" + file);
        tensors.push_back(t);
    }
    return tensors;
}

void write_tensors(const std::string& dir, const std::vector<at::Tensor>& tensors) {
    std::ofstream list(dir + "/outputs.txt");
    for (size_t i = 0; i < tensors.size(); ++i) {
        const at::Tensor t = tensors[i].cpu().contiguous();
        const std::string file = "out_" + std::to_string(i) + ".bin";
        std::ofstream data(dir + "/" + file, std::ios::binary);
        data.write(static_cast<const char*>(t.data_ptr()), (std::streamsize)t.nbytes());
        list << file << " " << dtype_name(t.scalar_type());
        for (int64_t s : t.sizes()) list << " " << s;
        list << "\n";
    }
    if (!list) throw std::runtime_error("cannot write " + dir + "/outputs.txt");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 6) {
        std::cerr << "usage: " << argv[0]
                  << " <pcops library> <package.pt2> <cpu|cuda> <input dir> <output dir>\n";
        return 2;
    }
    const std::string library = argv[1], package = argv[2], device = argv[3];
    const std::string in_dir = argv[4], out_dir = argv[5];
    try {
        // Registers torch.ops.pcops.* (kept loaded until the process ends).
        if (dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL) == nullptr)
            throw std::runtime_error(std::string("cannot load pcops: ") + dlerror());
        torch::inductor::AOTIModelPackageLoader loader(package);
        std::vector<at::Tensor> inputs = read_tensors(in_dir);
        for (at::Tensor& t : inputs) t = t.to(device);
        c10::AutoGradMode no_grad(false);
        const std::vector<at::Tensor> outputs = loader.run(inputs);
        write_tensors(out_dir, outputs);
        std::cout << package << " on " << device << ": " << outputs.size() << " outputs\n";
        for (size_t i = 0; i < outputs.size(); ++i) {
            const at::Tensor& t = outputs[i];
            std::cout << "  output " << i << ": " << dtype_name(t.scalar_type()) << " "
                      << t.sizes() << "\n";
        }
        // A classifier's logits [B, K]: the predicted class of each cloud.
        if (outputs.size() == 1 && outputs[0].dim() == 2 && outputs[0].is_floating_point()) {
            const at::Tensor classes = outputs[0].argmax(1).cpu();
            std::cout << "  run_model predictions: [";
            for (int64_t b = 0; b < classes.numel(); ++b)
                std::cout << (b ? ", " : "") << classes.data_ptr<int64_t>()[b];
            std::cout << "]\n";
        }
    } catch (const std::exception& e) {
        std::cerr << "run_model: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
